"""python -m rlfleet.services.buffer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]"""

from rlfleet.services.buffer.server import main

raise SystemExit(main())
