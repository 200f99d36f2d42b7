from specbench.cli import main

raise SystemExit(main())
