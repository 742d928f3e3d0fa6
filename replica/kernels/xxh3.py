"""XXH3-64 (seed 0, default secret) of one piece of a tensor, inside the fused pass: digest version 3's per-piece hash.

Digest version 3 (replica/digest.py) hashes each tensor in pieces of whole rows with the standard XXH3-64, so the
kernel can hash each work item's outputs while they are still in cache, instead of a second pass reading the whole
state again from memory. This is the algorithm's long-input path (inputs over 240 bytes; xxhash's XXH3_hashLong_64b)
written out for numba; `xxhash.xxh3_64_intdigest` is the specification, and tests compare the two on every length
class. Pieces of 240 bytes or less (small blocks only) are left to that library by the caller (digest.py).

Words are read as u64, so a piece that starts mid-word (a block with an odd column count) is copied to an aligned
buffer first; the input is little-endian bytes either way.
"""
import numpy as np
from numba import carray

from ._jit import helper, u32_ptr, u64_ptr

_SECRET = bytes.fromhex(  # XXH3_kSecret, the default secret (192 bytes)
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221b8084674f743248e"
    "e03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8a8fa763fe39c343ff9dcbbc7c70b4f1d"
    "8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc"
    "8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")


def _le64(offset: int) -> int:
    return int.from_bytes(_SECRET[offset:offset + 8], "little")


KEYS = np.array([_le64(8 * j) for j in range(24)], np.uint64)                 # stripe s, lane l reads KEYS[s + l]
SCRAMBLE = np.array([_le64(128 + 8 * lane) for lane in range(8)], np.uint64)  # after each block of 16 stripes
LAST = np.array([_le64(121 + 8 * lane) for lane in range(8)], np.uint64)      # the last stripe (secret end - 64 - 7)
MERGE = np.array([_le64(11 + 8 * lane) for lane in range(8)], np.uint64)      # the final merge of the 8 lanes
INIT = np.array([0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1], np.uint64)
LO, S32, S47 = np.uint64(0xFFFFFFFF), np.uint64(32), np.uint64(47)
PRIME32_1, PRIME64_1, MX1 = np.uint64(0x9E3779B1), np.uint64(0x9E3779B185EBCA87), np.uint64(0x165667919E3779F9)


@helper
def _mul_fold(a, b):
    """The 128-bit product of a and b, its halves xor-ed (XXH3_mul128_fold64)."""
    lo_lo, hi_lo = (a & LO) * (b & LO), (a >> S32) * (b & LO)
    lo_hi, hi_hi = (a & LO) * (b >> S32), (a >> S32) * (b >> S32)
    cross = (lo_lo >> S32) + (hi_lo & LO) + lo_hi
    return ((cross << S32) | (lo_lo & LO)) ^ ((hi_lo >> S32) + (cross >> S32) + hi_hi)


BLOCK_WORDS = 256  # XXH3 scrambles its accumulators after every 1,024 bytes: the unit the kernel hashes as it goes


@helper
def piece_hash(addr, nwords):
    """XXH3-64 of the nwords * 4 bytes at addr (nwords * 4 > 240)."""
    if addr % 8 == 0:
        w, d = carray(u32_ptr(addr), nwords), carray(u64_ptr(addr), nwords // 2)
    else:  # a piece starting mid-word (odd column count): copied aligned first
        d = np.empty((nwords + 1) // 2, np.uint64)
        w = d.view(np.uint32)
        src = u32_ptr(addr)
        for i in range(nwords):
            w[i] = src[i]
    acc = INIT.copy()
    for n in range(blocks(nwords)):
        absorb(acc, d, n)
    return finish(acc, w, d, nwords)


@helper
def blocks(nwords):
    """The whole blocks XXH3 scrambles after (its last block never is, even when whole)."""
    return (nwords * 4 - 1) // 1024


@helper
def absorb(acc, d, n):
    """Block n (16 stripes of 64 bytes) of an 8-byte-aligned piece d (its u64 words) into acc, then the scramble."""
    a0, a1, a2, a3, a4, a5, a6, a7 = acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]
    a0, a1, a2, a3, a4, a5, a6, a7 = _stripes(a0, a1, a2, a3, a4, a5, a6, a7, d, n * 128, 16)
    acc[0], acc[1] = ((a0 ^ (a0 >> S47)) ^ SCRAMBLE[0]) * PRIME32_1, ((a1 ^ (a1 >> S47)) ^ SCRAMBLE[1]) * PRIME32_1
    acc[2], acc[3] = ((a2 ^ (a2 >> S47)) ^ SCRAMBLE[2]) * PRIME32_1, ((a3 ^ (a3 >> S47)) ^ SCRAMBLE[3]) * PRIME32_1
    acc[4], acc[5] = ((a4 ^ (a4 >> S47)) ^ SCRAMBLE[4]) * PRIME32_1, ((a5 ^ (a5 >> S47)) ^ SCRAMBLE[5]) * PRIME32_1
    acc[6], acc[7] = ((a6 ^ (a6 >> S47)) ^ SCRAMBLE[6]) * PRIME32_1, ((a7 ^ (a7 >> S47)) ^ SCRAMBLE[7]) * PRIME32_1


@helper
def _stripes(a0, a1, a2, a3, a4, a5, a6, a7, d, j0, count):
    """`count` stripes from u64 word j0 (XXH3_accumulate_512): lanes written out, so LLVM keeps them in vector
    registers."""
    for s in range(count):
        j = j0 + 8 * s
        v0, v1, v2, v3, v4, v5, v6, v7 = d[j], d[j + 1], d[j + 2], d[j + 3], d[j + 4], d[j + 5], d[j + 6], d[j + 7]
        k0, k1, k2, k3 = v0 ^ KEYS[s], v1 ^ KEYS[s + 1], v2 ^ KEYS[s + 2], v3 ^ KEYS[s + 3]
        k4, k5, k6, k7 = v4 ^ KEYS[s + 4], v5 ^ KEYS[s + 5], v6 ^ KEYS[s + 6], v7 ^ KEYS[s + 7]
        a0 += v1 + (k0 & LO) * (k0 >> S32)
        a1 += v0 + (k1 & LO) * (k1 >> S32)
        a2 += v3 + (k2 & LO) * (k2 >> S32)
        a3 += v2 + (k3 & LO) * (k3 >> S32)
        a4 += v5 + (k4 & LO) * (k4 >> S32)
        a5 += v4 + (k5 & LO) * (k5 >> S32)
        a6 += v7 + (k6 & LO) * (k6 >> S32)
        a7 += v6 + (k7 & LO) * (k7 >> S32)
    return a0, a1, a2, a3, a4, a5, a6, a7


@helper
def finish(acc, w, d, nwords):
    """The hash, once every whole block is in acc: the last block's stripes, the last 64 bytes, the merge."""
    n = blocks(nwords)
    stripes = ((nwords * 4 - 1) - 1024 * n) // 64
    a0, a1, a2, a3, a4, a5, a6, a7 = _stripes(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7], d,
                                              n * 128, stripes)
    acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7] = a0, a1, a2, a3, a4, a5, a6, a7
    last = nwords - 16  # the last 64 bytes, wherever they start: u32 pairs
    for lane in range(8):
        dv = np.uint64(w[last + 2 * lane]) | (np.uint64(w[last + 2 * lane + 1]) << S32)
        dk = dv ^ LAST[lane]
        acc[lane ^ 1] += dv
        acc[lane] += (dk & LO) * (dk >> S32)
    r = np.uint64(nwords * 4) * PRIME64_1
    for i in range(4):
        r += _mul_fold(acc[2 * i] ^ MERGE[2 * i], acc[2 * i + 1] ^ MERGE[2 * i + 1])
    r ^= r >> np.uint64(37)
    r *= MX1
    return r ^ (r >> S32)
