"""``python -m minilms.trace ...``: see ``minilms.trace.command``."""
from minilms.commands.common import run
from minilms.trace.command import main

if __name__ == "__main__":
    raise SystemExit(run(main))
