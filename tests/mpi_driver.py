"""``mpiexec -n N python -m tests.mpi_driver RANK ITERATION MODE CONFIG [train args]``: trains as
``python -m minilms.train CONFIG [train args]`` does, except that rank RANK, when it is about to
run iteration ITERATION, dies (MODE ``kill``: SIGKILL; ``exit``: leaves with status 1 and no MPI
clean-up) or hangs (``hang``: sleeps for an hour). For tests of what the other ranks do."""
import os
import signal
import sys
import time

from minilms.commands.common import run
from minilms.commands.train import main
from minilms.lms import LmsExecutor


def fail_at(rank: int, iteration: int, mode: str) -> None:
    submit = LmsExecutor.submit      # what the trainer calls for each training iteration

    def failing(self, inputs, train=True):
        me = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0)))
        if train and me == rank and self.iteration + 1 == iteration:
            print(f"driver: rank {me} {mode} at iteration {iteration}", file=sys.stderr,
                  flush=True)
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "exit":
                os._exit(1)
            time.sleep(3600)
        return submit(self, inputs, train)
    LmsExecutor.submit = failing


if __name__ == "__main__":
    rank, iteration, mode, *args = sys.argv[1:]
    fail_at(int(rank), int(iteration), mode)
    raise SystemExit(run(main, args))
