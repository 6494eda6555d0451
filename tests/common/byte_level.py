"""GPT-2's byte-level BPE alphabet, shared by the test scripts that read
byte-level vocabularies (tests/tokenizer/gen_tok_golden.py,
tests/parity/gpu_tp.py). Needs nothing outside the standard library, so it
also runs on the GPU machine."""


def unicode_to_bytes():
    """Vocabulary characters -> the bytes they stand for (the inverse of
    GPT-2's bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}
