"""The gpukmod netlink protocol, as pure encoding and decoding (docs/gpukmod.md, design §7).

No sockets here: the backends move the bytes this module makes and parses. The command
parser mirrors the kernel's ``gk_parse`` exactly (same grammar, same errno for the same
mistake), so the guest tests can check the two against each other and the property tests
can pin the grammar without a kernel.

Wire format, host byte order as netlink always is:

- every message is ``struct nlmsghdr`` (16 bytes: u32 len, u16 type, u16 flags, u32 seq,
  u32 pid) plus a payload padded to 4 bytes;
- commands (user → kernel) have type ``MSG_COMMAND`` (0x10) and an ASCII payload:
  ``Register``, ``Flush`` or ``<verb>(<N>):<id>[ <id>]...`` with exactly N ids, 1 <= N <= 64, each id a
  pid-namespace inode, decimal, 1..2**32-1, no sign, no leading zeros, no duplicates, one
  space between ids; verbs ``add delete detect undetect release``; at most 1024 bytes, one
  trailing NUL tolerated;
- the kernel answers each command sent with ``NLM_F_ACK`` with an ``NLMSG_ERROR`` message
  whose error is 0 or a negative errno;
- a notice (kernel → registered listener) has type ``MSG_NOTICE`` (0x11) and an 8-byte u64
  payload: the pid-namespace inode.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass
from enum import Enum

NETLINK_UNIT = 31
MSG_COMMAND = 0x10
MSG_NOTICE = 0x11
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
IOC_TYPE_GPU = 0x46
MAX_IDS = 64
MAX_COMMAND_LEN = 1024
MAX_ID = 2**32 - 1

_HEADER = struct.Struct("=IHHII")
_NOTICE = struct.Struct("=Q")
_ERRNO = struct.Struct("=i")
HEADER_LEN = _HEADER.size


class Verb(Enum):
    """Command verbs, spelled as on the wire."""

    REGISTER = "Register"
    FLUSH = "Flush"
    ADD = "add"
    DELETE = "delete"
    DETECT = "detect"
    UNDETECT = "undetect"
    RELEASE = "release"


# Whole-module commands: a bare word, no ids.
BARE_VERBS = frozenset({Verb.REGISTER, Verb.FLUSH})


class CommandRejected(ValueError):
    """A command the kernel would refuse; ``errno`` is the code the kernel answers with."""

    def __init__(self, code: int, reason: str) -> None:
        self.errno = code
        self.reason = reason
        super().__init__(f"{reason} (errno {errno.errorcode.get(code, code)})")


@dataclass(frozen=True)
class Command:
    """One command: a verb and the pid-namespace inodes it applies to (none for Register and Flush)."""

    verb: Verb
    ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Message:
    """One netlink message: header fields and the unpadded payload."""

    type: int
    flags: int
    seq: int
    pid: int
    payload: bytes


def validate_ids(verb: Verb, ids: tuple[int, ...]) -> None:
    """Raise ``CommandRejected`` unless ``ids`` suit ``verb`` (same rules as the kernel)."""
    if verb in BARE_VERBS:
        if ids:
            raise CommandRejected(errno.EINVAL, f"{verb.value} takes no ids")
        return
    if not ids:
        raise CommandRejected(errno.EINVAL, f"{verb.value} needs at least one pid-namespace inode")
    if len(ids) > MAX_IDS:
        raise CommandRejected(errno.E2BIG, f"{verb.value} takes at most {MAX_IDS} ids per message, got {len(ids)}")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise CommandRejected(errno.EINVAL, f"id {i!r} is not an integer")
        if not 1 <= i <= MAX_ID:
            raise CommandRejected(errno.ERANGE if i > MAX_ID else errno.EINVAL, f"id {i} is outside 1..{MAX_ID}")
    if len(set(ids)) != len(ids):
        raise CommandRejected(errno.EINVAL, f"{verb.value} names an id twice: {list(ids)}")


def encode_command(command: Command) -> bytes:
    """The ASCII payload for ``command``, checked first so we never send what the kernel refuses."""
    validate_ids(command.verb, command.ids)
    if command.verb in BARE_VERBS:
        return command.verb.value.encode("ascii")
    text = f"{command.verb.value}({len(command.ids)}):" + " ".join(str(i) for i in command.ids)
    return text.encode("ascii")


def _parse_uint(text: bytes, pos: int) -> tuple[int, int]:
    end = pos
    while end < len(text) and 0x30 <= text[end] <= 0x39:
        end += 1
    if end == pos:
        raise CommandRejected(errno.EINVAL, f"expected a decimal number at byte {pos}")
    if text[pos] == 0x30 and end - pos > 1:
        raise CommandRejected(errno.EINVAL, f"leading zero in number at byte {pos}")
    value = int(text[pos:end])
    if value > MAX_ID:
        raise CommandRejected(errno.ERANGE, f"number at byte {pos} exceeds {MAX_ID}")
    return value, end


def parse_command(payload: bytes) -> Command:
    """Parse a command payload the way the kernel does; raise ``CommandRejected`` like it would."""
    if len(payload) > MAX_COMMAND_LEN:
        raise CommandRejected(errno.EMSGSIZE, f"command is {len(payload)} bytes, the limit is {MAX_COMMAND_LEN}")
    if payload.endswith(b"\0"):
        payload = payload[:-1]
    if not payload or b"\0" in payload:
        raise CommandRejected(errno.EINVAL, "empty command or NUL inside it")
    bare = next((v for v in BARE_VERBS if payload == v.value.encode()), None)
    if bare is not None:
        return Command(bare)
    verb = next(
        (v for v in Verb if v not in BARE_VERBS and payload.startswith(v.value.encode() + b"(")),
        None,
    )
    if verb is None:
        raise CommandRejected(errno.EINVAL, f"unknown verb in {payload[:32]!r}")
    count, pos = _parse_uint(payload, len(verb.value) + 1)
    if count == 0:
        raise CommandRejected(errno.EINVAL, "N must be at least 1")
    if count > MAX_IDS:
        raise CommandRejected(errno.E2BIG, f"N={count} exceeds {MAX_IDS}")
    if payload[pos : pos + 2] != b"):":
        raise CommandRejected(errno.EINVAL, f"expected '):' at byte {pos}")
    pos += 2
    ids: list[int] = []
    for i in range(count):
        if i:
            if payload[pos : pos + 1] != b" ":
                raise CommandRejected(errno.EINVAL, f"expected {count} ids, found {i}")
            pos += 1
        value, pos = _parse_uint(payload, pos)
        if value == 0 or value in ids:
            raise CommandRejected(errno.EINVAL, f"id {value} is zero or repeated")
        ids.append(value)
    if pos != len(payload):
        raise CommandRejected(errno.EINVAL, f"trailing bytes after {count} ids at byte {pos}")
    return Command(verb, tuple(ids))


def _pad(n: int) -> int:
    return (n + 3) & ~3


def encode_message(msg_type: int, payload: bytes, *, seq: int = 0, pid: int = 0, flags: int = NLM_F_REQUEST) -> bytes:
    """One netlink message: the 16-byte header, the payload, zero padding to 4 bytes."""
    length = HEADER_LEN + len(payload)
    return _HEADER.pack(length, msg_type, flags, seq & 0xFFFFFFFF, pid) + payload + b"\0" * (_pad(length) - length)


def encode_request(command: Command, seq: int) -> bytes:
    """A command message that asks for an ACK, so every command gets its errno back."""
    return encode_message(MSG_COMMAND, encode_command(command), seq=seq, flags=NLM_F_REQUEST | NLM_F_ACK)


def decode_messages(buf: bytes) -> list[Message]:
    """Split a datagram into messages; ``ValueError`` on a truncated or inconsistent header."""
    out: list[Message] = []
    pos = 0
    while pos < len(buf):
        if len(buf) - pos < HEADER_LEN:
            raise ValueError(f"netlink: {len(buf) - pos} trailing bytes, shorter than a header")
        length, msg_type, flags, seq, pid = _HEADER.unpack_from(buf, pos)
        if length < HEADER_LEN or pos + length > len(buf):
            raise ValueError(f"netlink: message length {length} at offset {pos} does not fit {len(buf)} bytes")
        out.append(Message(msg_type, flags, seq, pid, bytes(buf[pos + HEADER_LEN : pos + length])))
        pos += _pad(length)
    return out


def decode_ack(message: Message) -> int:
    """The errno (0 or positive) carried by an ``NLMSG_ERROR`` message."""
    if message.type != NLMSG_ERROR or len(message.payload) < _ERRNO.size:
        raise ValueError(f"netlink: not an ACK: type {message.type}, {len(message.payload)} bytes")
    (code,) = _ERRNO.unpack_from(message.payload)
    return -int(code)


def ack_seq(message: Message) -> int:
    """The sequence number of the request an ACK answers (from the echoed header)."""
    if len(message.payload) >= _ERRNO.size + HEADER_LEN:
        return int(_HEADER.unpack_from(message.payload, _ERRNO.size)[3])
    return message.seq


def encode_notice(inode: int) -> bytes:
    """A notice as the kernel sends it (tests and the property suite use it)."""
    return encode_message(MSG_NOTICE, _NOTICE.pack(inode), flags=0)


def decode_notice(message: Message) -> int:
    """The pid-namespace inode a notice carries."""
    if message.type != MSG_NOTICE or len(message.payload) != _NOTICE.size:
        raise ValueError(f"netlink: not a notice: type {message.type}, {len(message.payload)} bytes")
    return int(_NOTICE.unpack(message.payload)[0])


def ioc(direction: int, ioc_type: int, nr: int, size: int) -> int:
    """Linux ``_IOC(dir, type, nr, size)`` for x86 (dir 0 none, 1 write, 2 read)."""
    return (direction << 30) | (size << 16) | (ioc_type << 8) | nr


def ioc_type(cmd: int) -> int:
    """Linux ``_IOC_TYPE(cmd)``."""
    return (cmd >> 8) & 0xFF


def parse_modinfo(section: bytes) -> dict[str, str]:
    """Turn an ELF ``.modinfo`` section (NUL-separated ``key=value``) into a dict."""
    out: dict[str, str] = {}
    for item in section.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            out.setdefault(key.decode("ascii", "replace"), value.decode("utf-8", "replace"))
    return out


def elf_section(image: bytes, name: str) -> bytes:
    """The bytes of one section of a 64-bit little-endian ELF file (a ``.ko``)."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        base = shoff + i * shentsize
        (sh_name,) = struct.unpack_from("<I", image, base)
        sh_offset, sh_size = struct.unpack_from("<QQ", image, base + 0x18)
        return sh_name, sh_offset, sh_size

    _, str_off, str_size = header(shstrndx)
    strtab = image[str_off : str_off + str_size]
    for i in range(shnum):
        sh_name, off, size = header(i)
        if strtab[sh_name : strtab.index(b"\0", sh_name)].decode() == name:
            return image[off : off + size]
    raise ValueError(f"no {name} section")
