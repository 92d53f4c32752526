"""``python -m spec_fused ...``: the same CLI as the ``spec-fused`` console script, for
environments where the script is not on PATH (a venv that is not activated, a container)."""

import sys

from spec_fused.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
