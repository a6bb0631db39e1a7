#!/usr/bin/env python3
"""Independent reader of a Megatron-LM indexed dataset, for src/data/indexed_dataset_test.cpp.

Parses PREFIX.idx the way megatron/core/datasets/indexed_dataset.py's _IndexReader does (struct
header, then numpy.frombuffer of the int32 sequence lengths, int64 sequence pointers and int64
document indices at the offsets that follow), reads every sequence from PREFIX.bin the way
_MMapBinReader does (numpy.frombuffer at the pointer), and prints one JSON object.

Usage: check_megatron_idx.py PREFIX. Exits 3 when numpy is missing, 1 when the files are bad.
"""
import json
import struct
import sys

try:
    import numpy
except ImportError:
    print("numpy is not installed", file=sys.stderr)
    sys.exit(3)

HEADER = b"MMIDIDX\x00\x00"
DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


def main() -> int:
    prefix = sys.argv[1]
    with open(prefix + ".idx", "rb") as stream:
        if stream.read(9) != HEADER:
            print("bad header", file=sys.stderr)
            return 1
        version = struct.unpack("<Q", stream.read(8))[0]
        code = struct.unpack("<B", stream.read(1))[0]
        sequence_count = struct.unpack("<Q", stream.read(8))[0]
        document_count = struct.unpack("<Q", stream.read(8))[0]
        offset = stream.tell()
    dtype = DTYPES[code]
    buffer = memoryview(numpy.memmap(prefix + ".idx", mode="r", order="C"))
    lengths = numpy.frombuffer(buffer, dtype=numpy.int32, count=sequence_count, offset=offset)
    pointers = numpy.frombuffer(buffer, dtype=numpy.int64, count=sequence_count,
                                offset=offset + lengths.nbytes)
    documents = numpy.frombuffer(buffer, dtype=numpy.int64, count=document_count,
                                 offset=offset + lengths.nbytes + pointers.nbytes)
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    sequences = [numpy.frombuffer(data, dtype=dtype, count=int(n), offset=int(p)).tolist()
                 for n, p in zip(lengths, pointers)]
    print(json.dumps({
        "version": version,
        "dtype_code": code,
        "dtype": numpy.dtype(dtype).name,
        "sequence_count": sequence_count,
        "document_count": document_count,
        "sequence_lengths": lengths.tolist(),
        "sequence_pointers": pointers.tolist(),
        "document_indices": documents.tolist(),
        "sequences": sequences,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
