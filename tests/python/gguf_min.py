"""A minimal GGUF (v2/v3) reader for test references: metadata and F32/F16 tensors as numpy."""
import struct

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


class GGUF:
    def __init__(self, path):
        self.buf = open(path, "rb").read()
        self.off = 0
        if self.buf[:4] != b"GGUF":
            raise ValueError(path + ": not a GGUF file")
        self.off = 4
        self.version = self._u32()
        n_tensors = self._u64()
        n_kv = self._u64()
        self.meta = {}
        for _ in range(n_kv):
            key = self._str()
            self.meta[key] = self._value(self._u32())
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u32()
            dims = [self._u64() for _ in range(n_dims)]
            ttype = self._u32()
            offset = self._u64()
            self.tensors[name] = (dims, ttype, offset)
        align = self.meta.get("general.alignment", 32)
        self.data_start = (self.off + align - 1) // align * align

    def _read(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += struct.calcsize(fmt)
        return v

    def _u32(self):
        return self._read("<I")

    def _u64(self):
        return self._read("<Q")

    def _str(self):
        n = self._u64()
        s = self.buf[self.off:self.off + n].decode("utf-8", errors="replace")
        self.off += n
        return s

    def _value(self, t):
        if t in _SCALARS:
            return self._read(_SCALARS[t])
        if t == 8:
            return self._str()
        if t == 9:
            et = self._u32()
            n = self._u64()
            return [self._value(et) for _ in range(n)]
        raise ValueError("unknown GGUF value type %d" % t)

    def tensor(self, name):
        """The tensor as a numpy array shaped like numpy (dims reversed), F32 or F16 only."""
        dims, ttype, offset = self.tensors[name]
        n = int(np.prod(dims))
        start = self.data_start + offset
        if ttype == 0:
            a = np.frombuffer(self.buf, dtype="<f4", count=n, offset=start)
        elif ttype == 1:
            a = np.frombuffer(self.buf, dtype="<f2", count=n, offset=start).astype(np.float32)
        else:
            raise ValueError("tensor %s has type %d; this reader reads F32 and F16" % (name, ttype))
        return a.reshape(list(reversed(dims)))
