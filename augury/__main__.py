from augury.cli import main

raise SystemExit(main())
