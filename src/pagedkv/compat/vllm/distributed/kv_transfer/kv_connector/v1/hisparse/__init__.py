"""HiSparse connector names of vLLM (see ``_outside``)."""
