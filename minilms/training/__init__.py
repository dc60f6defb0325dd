"""Training: the loop (``trainer``), checkpoints as ``.npz`` without pickle (``checkpoint``) and
data-parallel training over MPI (``distributed``)."""
