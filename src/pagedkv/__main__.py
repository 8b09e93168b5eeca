"""``python -m pagedkv``: the same as the ``pagedkv`` command."""

from pagedkv.cli import main

main()
