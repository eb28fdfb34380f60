"""``python -m rlp_client ...``: the same as the ``rlp`` console script."""

import sys

from rlp_client.cli import main

sys.exit(main())
