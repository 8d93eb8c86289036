"""The cluster's SSH trust: a key pair made per launch, and the files that carry it into containers.

The key pair exists only in memory here and inside the cluster's containers (as files written through the
Docker API); it is never in an image, an environment variable or a log.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.core.protocol import MPIUSER_UID


@dataclass(frozen=True)
class KeyPair:
    private: bytes
    public: str

    def __repr__(self) -> str:  # never print the private half
        return f"KeyPair(public={self.public[:32]}...)"


def make_key_pair(comment: str) -> KeyPair:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
        )
        return KeyPair(private=path.read_bytes(), public=path.with_suffix(".pub").read_text().strip())


def tar_files(files: dict[str, tuple[bytes, int]], uid: int = MPIUSER_UID) -> bytes:
    """A tar archive of {relative path: (content, mode)} owned by uid, for Container.put_archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        directories = sorted({str(Path(name).parent) for name in files} - {"."})
        for directory in directories:
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o700, uid, uid, time.time()
            archive.addfile(info)
        for name, (content, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(content), mode, uid, uid, time.time()
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()
