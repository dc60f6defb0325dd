"""What the commands share: the rule that a mistake is one line on stderr with exit code 2, never
a traceback. In a data-parallel run (``minilms.training.distributed``) a rank that fails ends the
others too (MPI_Abort)."""
import sys

from ..config import config_error_line
from ..errors import ConfigError, MinilmsError


def run(main, argv=None) -> int:
    """Call ``main(argv)``; a MinilmsError (bad config, bad data, out of memory) is one line on
    stderr and exit code 2. ``main`` may attach the config it loaded as ``error.config``."""
    from ..training.distributed import abort_if_distributed
    try:
        return main(argv) or 0
    except MinilmsError as error:
        config = getattr(error, "config", None)
        # a ConfigError about a flag (--link, --lms) is the flag's, not the config file's
        in_file = isinstance(error, ConfigError) and not str(error.key).startswith("-")
        line = config_error_line(error, config) if config is not None and in_file else \
            " ".join(str(error).split())
        print(f"error: {line}", file=sys.stderr)
        abort_if_distributed(error.exit_code)     # the other ranks must not wait for this one
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        abort_if_distributed(130)
        return 130
    except Exception:
        abort_if_distributed(1, traceback=True)
        raise
