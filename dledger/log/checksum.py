"""The CRC every stored byte is checked with: CRC-32 (IEEE, as zlib.crc32), computed by ISA-L.

ISA-L's folding implementation gives the same values as zlib.crc32 about four times faster on
1 KiB bodies here (0.19 us against 0.87 us), and a body CRC is computed on every append, every
read that checks an entry and every entry recovery walks. The format does not change.
"""

from __future__ import annotations

from isal.isal_zlib import crc32

__all__ = ["crc32"]
