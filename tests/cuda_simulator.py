"""Imported for its effect, before anything imports numba.cuda: with no GPU driver here and no explicit choice
(NUMBA_ENABLE_CUDASIM unset), the Numba-CUDA kernels run on Numba's simulator, as scripts/test.sh runs them."""

import os
import shutil
import sys

if "NUMBA_ENABLE_CUDASIM" not in os.environ and shutil.which("nvidia-smi") is None:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if "numba.cuda" not in sys.modules:  # numba read its config at import: read it again
        try:
            import numba.core.config

            numba.core.config.reload_config()
        except ImportError:  # (no numba: nothing to configure)
            pass
