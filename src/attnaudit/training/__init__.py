"""Training, evaluation and run directories (``trainer``, ``checkpoint``)."""
