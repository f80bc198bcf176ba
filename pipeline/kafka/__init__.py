"""Kafka plumbing shared by the workers and the client: producer, partitioner, offset progress."""
