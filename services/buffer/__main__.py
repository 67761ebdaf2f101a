"""python -m services.buffer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]"""

from services.buffer.server import main

raise SystemExit(main())
