"""Kafka's default key partitioner (murmur2, as the Java client and aiokafka compute it).

Every topic is keyed by stream path with equal partition counts, so one function tells where a
stream lives in all of them. Producers use librdkafka's `murmur2_random`, which is the same hash.
"""

from __future__ import annotations

import functools

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    full = length - length % 4
    for i in range(0, full, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


@functools.lru_cache(maxsize=65_536)
def partition_for(stream_path: str, partitions: int) -> int:
    # Cached: the journal worker checks every command's partition, and a stream's path repeats.
    return (murmur2(stream_path.encode()) & 0x7FFFFFFF) % partitions
