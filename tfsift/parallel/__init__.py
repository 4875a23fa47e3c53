"""Processes and their messages: the runtime, rank layout, MPI and Horovod collectives, sharding."""
