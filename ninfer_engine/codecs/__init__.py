"""The storage codecs, shared by the artifact, the kernels and the KV pool: how a tensor's values
are laid out in bytes and read back (`rowsplit`, `rowscale`, `blockscale`: the artifact's
weight formats, ninfer-format.md §2; `encodings`: their registry by name; `planes`: a stored
matrix as the planes the GEMV kernels read; `kv`: the KV pool's page codecs). A leaf package:
it imports torch and numpy only.
"""
