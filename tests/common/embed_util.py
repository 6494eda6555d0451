"""What the /v1/embeddings suites share: the cosine of two vectors, a
request's vectors, and llama.cpp's embedder (the reference) for a GGUF."""


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def embeddings(srv, name, inputs, **extra):
    """POST /v1/embeddings to a LocalServer: (the vectors in input order, the body)."""
    st, body = srv.json("POST", "/v1/embeddings", dict({"model": name, "input": inputs}, **extra))
    assert st == 200, body
    return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])], body


def llama_embedder(path, pooling, n_ctx):
    """llama-cpp-python's Llama over the GGUF at path, embedding with pooling (mean, cls or last)."""
    import llama_cpp
    pt = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
          "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}[pooling]
    return llama_cpp.Llama(path, embedding=True, pooling_type=pt, n_ctx=n_ctx, n_threads=2, verbose=False)
