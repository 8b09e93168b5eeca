"""vLLM's ``vllm.config.speculative``: the method and the flags the KV cache reads."""

from __future__ import annotations

from pagedkv.compat.vllm.config._base import ConfigPart

__all__ = ["SpeculativeConfig"]

# Drafters whose KV at a position depends on the token after it: their last cached block
# is volatile (dropped on a hit, or kept with lookahead block hashes).
_NEXT_TOKEN_DRAFTERS = ("eagle", "eagle3", "mtp")


class SpeculativeConfig(ConfigPart):
    DEFAULTS = {
        "method": None,
        "num_speculative_tokens": 0,
        "model": None,
        "draft_model_config": None,
        "disable_eagle_block_drop": False,
        "disable_lookahead_block_hashes": False,
    }

    def use_eagle(self) -> bool:
        return self.method in _NEXT_TOKEN_DRAFTERS

    def use_dflash(self) -> bool:
        return self.method == "dflash"

    def use_dspark(self) -> bool:
        return self.method == "dspark"

    def needs_eagle_block_drop(self) -> bool:
        """Whether draft KV at a position depends on the next token (EAGLE, EAGLE3, MTP;
        DFlash and DSpark draft from the target's hidden state alone)."""
        return self.method in _NEXT_TOKEN_DRAFTERS

    def use_eagle_block_drop(self) -> bool:
        return self.needs_eagle_block_drop() and not getattr(
            self, "disable_eagle_block_drop", False
        )

    def use_multi_module_mtp(self) -> bool:
        """MTP with more than one module in use: each reads one token further ahead."""
        draft = getattr(self, "draft_model_config", None)
        if self.method != "mtp" or draft is None:
            return False
        num_layers = getattr(getattr(draft, "hf_config", None), "num_nextn_predict_layers", 1)
        return min(num_layers, self.num_speculative_tokens) > 1
