"""``python -m streamworks`` is the ``streamworks`` command."""

from streamworks.cli import main

main()
