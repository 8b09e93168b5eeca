"""Built-in model adapters; importing this package registers them."""

from pagedkv.models.adapters import dense, encdec, hybrid, mamba_ssm, mla

__all__ = ["dense", "encdec", "hybrid", "mamba_ssm", "mla"]
