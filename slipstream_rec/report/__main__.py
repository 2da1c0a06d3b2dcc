"""``python -m slipstream_rec.report RUN_DIR [RUN_DIR ...] -o OUT``"""

from slipstream_rec.report.cli import main

raise SystemExit(main())
