from preclint.cli import main

raise SystemExit(main())
