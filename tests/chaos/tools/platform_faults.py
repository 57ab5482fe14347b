"""Real faults of the platform, brought about on a Postgres the test owns: a full disk under chosen tables, an
administrator terminating the services' backends, and every connection slot taken.

``FullDisk`` puts tables on a tablespace in a small tmpfs (mounting needs root, as in CI), with a low fillfactor
so that inserts extend the table files often; filling the tmpfs then makes every extension fail with SQLSTATE
53100 (``could not extend file ...: No space left on device``) until the filler is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg

TABLESPACE_MB = 16
SERVICE_APPLICATIONS = "saga-%"  # application_name of every service's connections (infra.db.create_pool)


def can_mount() -> str | None:
    """Why a tmpfs cannot be mounted here (None when it can): it needs root."""
    if os.geteuid() != 0:
        return "mounting a tmpfs for a full disk needs root (CI runs as root)"
    return None


class FullDisk:
    """A tablespace on a ``TABLESPACE_MB`` tmpfs that ``fill`` fills for a while; ``tables`` move onto it."""

    def __init__(self, admin_dsn: str, folder: Path, owner: str = "postgres") -> None:
        self._dsn = admin_dsn
        self._folder = folder
        self._owner = pwd.getpwnam(owner)
        self.name = f"full_{uuid.uuid4().hex[:8]}"
        self._moved: list[str] = []

    async def __aenter__(self) -> FullDisk:
        self._folder.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(subprocess.run, ["mount", "-t", "tmpfs", "-o", f"size={TABLESPACE_MB}m,mode=0700",
                                                 "tmpfs", str(self._folder)], check=True)
        os.chown(self._folder, self._owner.pw_uid, self._owner.pw_gid)
        conn = await asyncpg.connect(self._dsn)
        try:
            await conn.execute(f"CREATE TABLESPACE {self.name} LOCATION '{self._folder}'")
        finally:
            await conn.close()
        return self

    async def move(self, tables: Sequence[str]) -> None:
        """Put ``tables`` (and their indexes) on the tablespace; inserts fill a tenth of a page each."""
        conn = await asyncpg.connect(self._dsn)
        try:
            for table in tables:
                await conn.execute(f"ALTER TABLE {table} SET (fillfactor = 10)")
                await conn.execute(f"ALTER TABLE {table} SET TABLESPACE {self.name}")
                for index in await conn.fetch("SELECT indexrelid::regclass::text AS name FROM pg_index"
                                              " WHERE indrelid = $1::regclass", table):
                    await conn.execute(f"ALTER INDEX {index['name']} SET TABLESPACE {self.name}")
                self._moved.append(table)
        finally:
            await conn.close()

    async def fill(self, seconds: float) -> None:
        """No space left on the tablespace for ``seconds``; then the space comes back."""
        filler = self._folder / "filler"
        await asyncio.to_thread(_fill, filler)
        try:
            await asyncio.sleep(seconds)
        finally:
            filler.unlink()

    async def __aexit__(self, *exc_info: object) -> None:
        conn = await asyncpg.connect(self._dsn)
        try:
            for table in self._moved:  # back to the default tablespace, so this one can go
                await conn.execute(f"ALTER TABLE {table} SET TABLESPACE pg_default")
                for index in await conn.fetch("SELECT indexrelid::regclass::text AS name FROM pg_index"
                                              " WHERE indrelid = $1::regclass", table):
                    await conn.execute(f"ALTER INDEX {index['name']} SET TABLESPACE pg_default")
            await conn.execute(f"DROP TABLESPACE IF EXISTS {self.name}")
        finally:
            await conn.close()
            await asyncio.to_thread(subprocess.run, ["umount", str(self._folder)], check=False)


def _fill(path: Path) -> None:
    with path.open("wb") as handle, contextlib.suppress(OSError):  # until ENOSPC
        chunk = b"\0" * (1 << 20)
        while True:
            handle.write(chunk)
            handle.flush()


async def terminate_service_backends(admin_dsn: str) -> int:
    """What an administrator's ``pg_terminate_backend`` does to every service connection; how many ended."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        ended = await conn.fetchval(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name LIKE $1 AND pid <> pg_backend_pid()", SERVICE_APPLICATIONS)
    finally:
        await conn.close()
    return int(ended)


async def take_every_connection(admin_dsn: str, seconds: float) -> int:
    """End the services' connections, then hold every free connection slot for ``seconds``, so the services'
    pools meet ``too many connections`` (53300) when they reconnect; how many slots were held."""
    held: list[asyncpg.Connection] = []
    try:
        await terminate_service_backends(admin_dsn)
        for _ in range(50):  # the services reconnect as slots free up: take them, end theirs, until none is left
            while True:
                try:
                    held.append(await asyncpg.connect(admin_dsn, timeout=5))
                except asyncpg.TooManyConnectionsError:
                    break
            ended = await held[0].fetchval(  # asked on a held connection: no slot is left for another
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name LIKE $1", SERVICE_APPLICATIONS)
            if not ended:
                break
        await asyncio.sleep(seconds)
        return len(held)
    finally:
        await asyncio.gather(*(conn.close() for conn in held), return_exceptions=True)
