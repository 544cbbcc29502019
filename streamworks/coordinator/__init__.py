"""The control plane: membership, leases, assignment, routing and migrations.

``core/`` holds the pure decisions (no I/O); ``store``, ``service``, ``http`` and
``loop`` are thin shells around it.
"""
