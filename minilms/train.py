"""``python -m minilms.train CONFIG.yaml ...``: see ``minilms.commands.train``."""
from .commands.common import run
from .commands.train import main

if __name__ == "__main__":
    raise SystemExit(run(main))
