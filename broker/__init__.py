"""RocketMQ broker on the replicated log: milestone 2.

Storage formats, pure and replica-independent (docs/formats.md): `stored_message`,
`properties`, `message_id`, `tag_hash`, `consume_queue`, `index_file`; bounds in `limits`,
named errors in `errors`.
"""
