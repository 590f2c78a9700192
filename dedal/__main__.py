from dedal.cli import main

raise SystemExit(main())
