"""minilms: deep learning with Large Model Support from first principles.

Every blob lives on the host; the device holds one fixed pool; each step stages its working set
into the pool. See DESIGN.md for the vocabulary and the architecture.
"""
__version__ = "0.1.0"
