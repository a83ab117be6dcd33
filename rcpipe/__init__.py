"""rcpipe: a training pipeline for extractive question answering on SQuAD."""

__version__ = "0.1.0"
