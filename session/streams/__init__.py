"""Resumable streams: the token log (:mod:`.log`) and the multi-node protocol (:mod:`.cluster`).

A stream is a response's tokens and its end, written once by the node that
generates it and read by any node at any offset. Nothing here knows a
connection or a socket: the node runtime (:mod:`bargein.session.runtime`)
writes and reads through these interfaces.
"""
