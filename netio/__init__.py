"""Reading and writing trio socket streams in fewer system calls than trio's own methods.

Shared by the raft peer links (dledger/) and the remoting protocol (remoting/), which know
nothing of each other.
"""
