"""Table tests of gpukmod.protocol: the command grammar, netlink framing, notices, modinfo."""

from __future__ import annotations

import errno
import struct

import pytest

from gpukmod import protocol as p
from gpukmod.protocol import Command, CommandRejected, Verb

GOOD = [
    (Command(Verb.REGISTER), b"Register"),
    (Command(Verb.FLUSH), b"Flush"),
    (Command(Verb.ADD, (4026532001,)), b"add(1):4026532001"),
    (Command(Verb.DELETE, (1, 2, 3)), b"delete(3):1 2 3"),
    (Command(Verb.DETECT, (p.MAX_ID,)), b"detect(1):4294967295"),
    (Command(Verb.UNDETECT, (7, 5)), b"undetect(2):7 5"),
    (Command(Verb.RELEASE, tuple(range(1, 65))), b"release(64):" + b" ".join(str(i).encode() for i in range(1, 65))),
]


@pytest.mark.parametrize(("command", "wire"), GOOD)
def test_encode_and_parse_round_trip(command: Command, wire: bytes) -> None:
    assert p.encode_command(command) == wire
    assert p.parse_command(wire) == command
    assert p.parse_command(wire + b"\0") == command  # one trailing NUL is tolerated


BAD = [
    (b"", errno.EINVAL),
    (b"\0", errno.EINVAL),
    (b"\0\0", errno.EINVAL),
    (b"register", errno.EINVAL),
    (b"Register ", errno.EINVAL),
    (b"flush", errno.EINVAL),
    (b"Flush ", errno.EINVAL),
    (b"Flush(1):5", errno.EINVAL),  # a bare verb takes no ids, in any spelling
    (b"FlushRegister", errno.EINVAL),
    (b"add(1):5\0", 0),
    (b"add", errno.EINVAL),
    (b"add(1)", errno.EINVAL),
    (b"add(1):", errno.EINVAL),
    (b"add(0):", errno.EINVAL),
    (b"add(2):5", errno.EINVAL),
    (b"add(1):5 6", errno.EINVAL),
    (b"add(1):5 ", errno.EINVAL),
    (b"add(2):5  6", errno.EINVAL),
    (b"add(2):5,6", errno.EINVAL),
    (b"add(01):5", errno.EINVAL),
    (b"add(1):05", errno.EINVAL),
    (b"add(1):0", errno.EINVAL),
    (b"add(1):-5", errno.EINVAL),
    (b"add(2):5 5", errno.EINVAL),
    (b"add(1):4294967296", errno.ERANGE),
    (b"add(4294967296):1", errno.ERANGE),
    (b"add(65):1", errno.E2BIG),
    (b"add(1):5\0x", errno.EINVAL),
    (b"detect(1):5\n", errno.EINVAL),
    (b"x" * 1025, errno.EMSGSIZE),
    (b"adD(1):5", errno.EINVAL),
]


@pytest.mark.parametrize(("wire", "code"), BAD)
def test_parse_rejects_like_the_kernel(wire: bytes, code: int) -> None:
    if code == 0:
        assert p.parse_command(wire) == Command(Verb.ADD, (5,))
        return
    with pytest.raises(CommandRejected) as exc:
        p.parse_command(wire)
    assert exc.value.errno == code


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (Command(Verb.REGISTER, (1,)), errno.EINVAL),
        (Command(Verb.FLUSH, (1,)), errno.EINVAL),
        (Command(Verb.ADD, ()), errno.EINVAL),
        (Command(Verb.ADD, (0,)), errno.EINVAL),
        (Command(Verb.ADD, (2**32,)), errno.ERANGE),
        (Command(Verb.ADD, (3, 3)), errno.EINVAL),
        (Command(Verb.ADD, tuple(range(1, 66))), errno.E2BIG),
        (Command(Verb.ADD, (True,)), errno.EINVAL),
    ],
)
def test_encode_refuses_what_the_kernel_would(command: Command, code: int) -> None:
    with pytest.raises(CommandRejected) as exc:
        p.encode_command(command)
    assert exc.value.errno == code


def test_request_framing() -> None:
    raw = p.encode_request(Command(Verb.ADD, (5,)), seq=9)
    length, msg_type, flags, seq, pid = struct.unpack_from("=IHHII", raw)
    assert (length, msg_type, flags, seq, pid) == (16 + 8, p.MSG_COMMAND, p.NLM_F_REQUEST | p.NLM_F_ACK, 9, 0)
    assert raw[16:] == b"add(1):5"
    odd = p.encode_message(p.MSG_COMMAND, b"abc")
    assert len(odd) == 20 and struct.unpack_from("=I", odd)[0] == 19  # padded, length unpadded


def test_decode_ack_notice_and_batches() -> None:
    request = p.encode_message(p.MSG_COMMAND, b"add(1):5", seq=42)
    ack = p.encode_message(p.NLMSG_ERROR, struct.pack("=i", -errno.ENOENT) + request[:16])
    notice = p.encode_notice(4026532001)
    msgs = p.decode_messages(ack + notice)
    assert [m.type for m in msgs] == [p.NLMSG_ERROR, p.MSG_NOTICE]
    assert p.decode_ack(msgs[0]) == errno.ENOENT
    assert p.ack_seq(msgs[0]) == 42
    assert p.decode_notice(msgs[1]) == 4026532001
    with pytest.raises(ValueError):
        p.decode_notice(msgs[0])
    with pytest.raises(ValueError):
        p.decode_ack(msgs[1])


@pytest.mark.parametrize(
    "buf",
    [b"\x01", struct.pack("=IHHII", 8, 0, 0, 0, 0), struct.pack("=IHHII", 100, 0, 0, 0, 0)],
)
def test_decode_messages_rejects_truncated(buf: bytes) -> None:
    with pytest.raises(ValueError):
        p.decode_messages(buf)


def test_ioc_matches_linux() -> None:
    # _IOWR('F', 0x2b, 16) as a GPU driver would build it.
    cmd = p.ioc(3, 0x46, 0x2B, 16)
    assert cmd == 0xC010462B
    assert p.ioc_type(cmd) == p.IOC_TYPE_GPU


def _elf_with(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 LE file whose section headers name ``sections`` (enough for elf_section)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    body = b"".join(sections.values()) + names
    shoff = 64 + len(body)
    headers = [b"\0" * 64]
    offset, name_at = 64, 1
    for name, data in [*sections.items(), (".shstrtab", names)]:
        headers.append(struct.pack("<IIQQQQIIQQ", name_at, 1, 0, 0, offset, len(data), 0, 0, 1, 0))
        offset += len(data)
        name_at += len(name) + 1
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(headers), len(headers) - 1)
    return ehdr + body + b"".join(headers)


def test_modinfo_version_from_elf() -> None:
    image = _elf_with({".text": b"\x90" * 8, ".modinfo": b"license=GPL\0version=0.1.0\0srcversion=ABC\0"})
    info = p.parse_modinfo(p.elf_section(image, ".modinfo"))
    assert info["version"] == "0.1.0" and info["license"] == "GPL"
    with pytest.raises(ValueError):
        p.elf_section(image, ".missing")
    with pytest.raises(ValueError):
        p.elf_section(b"not an elf" * 10, ".modinfo")
