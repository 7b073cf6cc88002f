"""Terminal lines read by a daemon thread: splitting, UTF-8 across reads, EOF."""

from __future__ import annotations

import asyncio
import os

import pytest

from bargein.client.console import ConsoleLines
from tests.waiting import HANG_GUARD_S, wait_until


async def test_lines_come_whole_across_reads_and_eof_ends_them() -> None:
    read_end, write_end = os.pipe()
    try:
        lines = ConsoleLines(read_end)
        os.write(write_end, b"caf\xc3")  # a character cut between two reads
        reading = asyncio.create_task(lines.readline())
        await wait_until(lambda: lines._pending == "caf", "the first read to be decoded")
        assert not reading.done()  # no line break yet: the cut character waits in the decoder
        os.write(write_end, b"\xa9 au lait\r\nsecond\nlast without break")
        assert await asyncio.wait_for(reading, HANG_GUARD_S) == "café au lait"
        assert await lines.readline() == "second"
        os.close(write_end)
        write_end = -1
        assert await asyncio.wait_for(lines.readline(), HANG_GUARD_S) == "last without break"
        with pytest.raises(EOFError):
            await lines.readline()
    finally:
        if write_end >= 0:
            os.close(write_end)
        os.close(read_end)
