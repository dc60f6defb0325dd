"""``python -m minilms.train CONFIG.yaml ...``: see ``minilms.commands.train``."""
from minilms.commands.common import run
from minilms.commands.train import main

if __name__ == "__main__":
    raise SystemExit(run(main))
