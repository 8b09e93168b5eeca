from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_sim_exports_are_lazy_and_match_pagedkv_sim():
    code = (
        "import sys, pagedkv\n"
        "assert 'pagedkv.sim' not in sys.modules\n"
        "import pagedkv.sim as sim\n"
        "assert pagedkv.simulate is sim.simulate and pagedkv.SimSetup is sim.SimSetup\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_unknown_attribute_still_raises():
    import pagedkv

    with pytest.raises(AttributeError, match="no_such_name"):
        pagedkv.no_such_name  # noqa: B018
