"""What every service process runs on: gRPC servers and channels with auth and limits (rpc.py), the one service
skeleton and command line (service_skeleton.py, service_main.py), metrics (metrics.py), exit codes (exit_codes.py),
ports, the garbage-collector settings (gc_heap.py, process_exit.py), and how a child process is exec'd (exec_child.py).
The same code runs in a local run and in a cluster pod."""
