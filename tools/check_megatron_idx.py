#!/usr/bin/env python3
"""Independent reader of a Megatron-LM indexed dataset, for src/data/indexed_dataset_test.cpp.

Parses PREFIX.idx the way megatron/core/datasets/indexed_dataset.py's _IndexReader does (struct
header, then numpy.frombuffer of the int32 sequence lengths, int64 sequence pointers and int64
document indices at the offsets that follow), reads every sequence from PREFIX.bin the way
_MMapBinReader does (numpy.frombuffer at the pointer), and prints one JSON object.

With --permutation N SEED EPOCH it instead prints the JSON list of src/data/token_stream.h's
sample_permutation, computed here from its written definition (SplitMix64-driven Fisher-Yates).

With --numpy-shuffle N SEED it prints numpy.random.RandomState(SEED).shuffle of 0..N-1 (the
generator Megatron's GPTDataset shuffles with), for src/data/megatron_order.h's NumpyLegacyRandom.

With --gpt-dataset PREFIX T NUM_SAMPLES SEED it prints the samples Megatron-LM's GPTDataset draws
over every sequence of PREFIX (megatron/core/datasets/gpt_dataset.py, as its docstrings and
arguments describe it), derived here another way than megatron_order.cpp builds them: the
shuffled document order's tokens laid end to end, sample s being tokens [s*T, s*T + T] of that
line, and global sample k sample shuffle[k]. It prints the epochs, whether the last one was
shuffled apart, and per global sample its T + 1 tokens and their stream positions (the position
in PREFIX's own concatenation of sequences).

With FIRST END after SEED, the dataset is sequences [FIRST, END) (a split's). With --split TEXT N[,N...] it
prints, per N, the [begin, end) of sequences (or null) that Megatron's --split TEXT gives train,
validation and test over N sequences: the numbers in TEXT normalised by numpy, running sums as
book-ends, each end times N rounded by Python's round.

With --blend T NUM_SAMPLES SEED ITEM... it prints Megatron's blend of the --data-path list ITEM...
(weights and prefixes, or prefixes): per global sample its dataset, that dataset's sample, and its
tokens and positions. With --numpy-sums FILE it prints numpy.sum of each float64 list in FILE.

Usage: check_megatron_idx.py PREFIX | --permutation N SEED EPOCH | --numpy-shuffle N SEED |
       --gpt-dataset PREFIX T NUM_SAMPLES SEED [FIRST END] | --split TEXT N[,N...] |
       --blend T NUM_SAMPLES SEED ITEM... | --numpy-sums FILE.
Exits 3 when numpy is missing, 1 when the files are bad.
"""
import json
import math
import struct
import sys

MASK = (1 << 64) - 1


def splitmix64_mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def sample_permutation(n: int, seed: int, epoch: int) -> list:
    state = splitmix64_mix((splitmix64_mix(seed) + epoch) & MASK)
    perm = list(range(n))
    for i in range(n, 1, -1):
        threshold = (1 << 64) % i
        while True:
            state = (state + 0x9E3779B97F4A7C15) & MASK
            r = splitmix64_mix(state)
            if r >= threshold:
                break
        j = r % i
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return perm


if len(sys.argv) == 5 and sys.argv[1] == "--permutation":
    print(json.dumps(sample_permutation(*(int(a) for a in sys.argv[2:]))))
    sys.exit(0)

try:
    import numpy
except ImportError:
    print("numpy is not installed", file=sys.stderr)
    sys.exit(3)

HEADER = b"MMIDIDX\x00\x00"
DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


def read_dataset(prefix: str):
    """(sequence lengths, sequence token lists) of PREFIX."""
    with open(prefix + ".idx", "rb") as stream:
        stream.read(9 + 8)
        code = struct.unpack("<B", stream.read(1))[0]
        sequence_count = struct.unpack("<Q", stream.read(8))[0]
        stream.read(8)
        offset = stream.tell()
    buffer = memoryview(numpy.memmap(prefix + ".idx", mode="r", order="C"))
    lengths = numpy.frombuffer(buffer, dtype=numpy.int32, count=sequence_count, offset=offset)
    pointers = numpy.frombuffer(buffer, dtype=numpy.int64, count=sequence_count,
                                offset=offset + lengths.nbytes)
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    sequences = [numpy.frombuffer(data, dtype=DTYPES[code], count=int(n), offset=int(p)).tolist()
                 for n, p in zip(lengths, pointers)]
    return lengths.tolist(), sequences


def megatron_split(text: str, n: int) -> list:
    import re
    weights = [float(x) for x in re.findall(r"[.0-9]+", text)]
    weights += [0.0] * (3 - len(weights))
    w = numpy.array(weights, dtype=numpy.float64)
    w = (w / numpy.sum(w)).tolist()
    edges = [0]
    for x in w:
        edges.append(edges[-1] + x)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        out.append(None if hi <= lo else [int(round(lo * float(n))), int(round(hi * float(n)))])
    return out


def gpt_dataset(prefix: str, seq_length: int, num_samples: int, seed: int, first: int = 0, end: int = -1) -> dict:
    all_lengths, all_sequences = read_dataset(prefix)
    all_starts = numpy.concatenate(([0], numpy.cumsum(all_lengths)[:-1])).tolist() if all_lengths else []
    end = len(all_lengths) if end < 0 else end
    lengths, sequences, starts = all_lengths[first:end], all_sequences[first:end], all_starts[first:end]
    tokens = sum(lengths)
    # Enough epochs for num_samples windows and the last one's extra target token.
    epochs = 1
    while epochs * tokens < num_samples * seq_length + 1:
        epochs += 1
    apart = False
    if epochs > 1:
        before_last = ((epochs - 1) * tokens - 1) // seq_length
        apart = num_samples - before_last < int(0.80 * ((tokens - 1) // seq_length))
    rng = numpy.random.RandomState(seed)

    def shuffled_documents(repeats: int) -> list:
        order = numpy.tile(numpy.arange(len(lengths), dtype=numpy.int32), repeats)
        rng.shuffle(order)
        return order.tolist()

    documents = (shuffled_documents(epochs - 1) + shuffled_documents(1)) if apart else shuffled_documents(epochs)
    line_tokens, line_positions = [], []
    for d in documents:
        line_tokens.extend(sequences[d])
        line_positions.extend(range(starts[d], starts[d] + lengths[d]))
    count = (epochs * tokens - 1) // seq_length

    def shuffled_range(lo: int, hi: int) -> list:
        r = numpy.arange(lo, hi, dtype=numpy.int64)
        rng.shuffle(r)
        return r.tolist()

    order = (shuffled_range(0, before_last) + shuffled_range(before_last, count)) if apart else shuffled_range(0, count)
    samples, positions = [], []
    for s in order[:num_samples] if num_samples > 0 else order:
        samples.append(line_tokens[s * seq_length: s * seq_length + seq_length + 1])
        positions.append(line_positions[s * seq_length: s * seq_length + seq_length + 1])
    return {"num_epochs": epochs, "separate_final_epoch": apart, "num_built": count,
            "samples": samples, "positions": positions}


def blend(seq_length: int, num_samples: int, seed: int, items: list) -> dict:
    """Megatron's blend of a --data-path list (weights and prefixes, or prefixes), as its builder
    and BlendedDataset make it, told here in this script's words: the weights normalised by
    numpy; each dataset built for its share ceil(N * w) grown by 0.5 % and rounded up; the blend
    as long as the shares together; sample k taken from the dataset furthest behind its share so
    far (weights normalised once more), as that dataset's next sample. Without weights, one epoch
    of each dataset, weighted by its samples, min(N, their sum) long."""
    pairs = [items[i:i + 2] for i in range(0, len(items), 2)] if len(items) % 2 == 0 else []
    try:
        weights = [float(w) for w, _ in pairs] if pairs else None
        prefixes = [p.strip() for _, p in pairs]
    except ValueError:
        weights = None
    if weights is None:
        prefixes = [p.strip() for p in items]
        parts = [gpt_dataset(p, seq_length, 0, seed) for p in prefixes]
        sizes = [part["num_built"] for part in parts]
        share = (numpy.array(sizes, dtype=numpy.float64) / numpy.sum(numpy.array(sizes, dtype=numpy.float64))).tolist()
        size = min(num_samples, sum(sizes))
    else:
        w = numpy.array(weights, dtype=numpy.float64)
        w = (w / numpy.sum(w)).tolist()
        wanted = [math.ceil(num_samples * x) for x in w]
        parts = [gpt_dataset(p, seq_length, math.ceil(n * 1.005), seed) for p, n in zip(prefixes, wanted)]
        size = sum(wanted)
        share = numpy.array(w, dtype=numpy.float64)
        share = (share / numpy.sum(share)).tolist()
    taken = [0] * len(parts)
    dataset, dataset_sample = [], []
    for k in range(size):
        behind = [x * max(float(k), 1.0) - t for x, t in zip(share, taken)]
        d = behind.index(max(behind))
        dataset.append(d)
        dataset_sample.append(taken[d])
        taken[d] += 1
    count = min(num_samples, size)
    return {"size": size, "dataset": dataset[:count], "dataset_sample": dataset_sample[:count],
            "samples": [parts[d]["samples"][j] for d, j in zip(dataset[:count], dataset_sample[:count])],
            "positions": [parts[d]["positions"][j] for d, j in zip(dataset[:count], dataset_sample[:count])]}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--numpy-sums":
        with open(sys.argv[2]) as f:
            arrays = json.load(f)
        print(json.dumps([float(numpy.sum(numpy.array(a, dtype=numpy.float64))) for a in arrays]))
        return 0
    if len(sys.argv) >= 7 and sys.argv[1] == "--blend":
        print(json.dumps(blend(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--numpy-shuffle":
        values = numpy.arange(int(sys.argv[2]), dtype=numpy.int64)
        numpy.random.RandomState(int(sys.argv[3])).shuffle(values)
        print(json.dumps(values.tolist()))
        return 0
    if len(sys.argv) in (6, 8) and sys.argv[1] == "--gpt-dataset":
        print(json.dumps(gpt_dataset(sys.argv[2], *(int(a) for a in sys.argv[3:]))))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--split":
        print(json.dumps([megatron_split(sys.argv[2], int(n)) for n in sys.argv[3].split(",")]))
        return 0
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
