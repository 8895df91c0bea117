"""``python -m kafkaesque.cli``: the same as the ``kafkaesque`` command."""

from .main import main

raise SystemExit(main())
