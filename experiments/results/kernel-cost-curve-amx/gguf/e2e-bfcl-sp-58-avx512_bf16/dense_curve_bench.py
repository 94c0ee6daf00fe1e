"""`oospec bench run ...` with the GGUF curves taken out of the cost model (the dense curve, as before)."""
import sys
import oospec.engine.budget as budget
for key in [k for k in budget.CPU_CURVES if k[0].startswith("gguf-")]:
    budget.CPU_CURVES.pop(key)
from oospec.cli import main
sys.exit(main(sys.argv[1:]))
