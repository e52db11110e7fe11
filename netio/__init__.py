"""Reading and writing trio socket streams in fewer system calls than trio's own methods, and
the one rule for loading the optional C extensions (native.py).

Shared by the raft peer links and log (dledger/) and the remoting protocol (remoting/), which
know nothing of each other.
"""
