from qconform.cli import main

raise SystemExit(main())
