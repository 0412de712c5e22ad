"""Write a small pre-tokenized ArrayRecord file for MaxText's grain pipeline (runs in the MaxText venv).

    python maxtext_grain_data.py OUT.array_record RECORDS LENGTH VOCAB

Each record is a `tf.train.Example` (MaxText's vendored proto) with an int64
`text` feature of distinct random tokens, so a run that re-read data it had
already consumed would train differently.
"""

import sys

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter
from maxtext.input_pipeline.protos import example_pb2

out, records, length, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(1)
writer = ArrayRecordWriter(out, "group_size:1")
for _ in range(records):
    example = example_pb2.Example()
    example.features.feature["text"].int64_list.value.extend(rng.integers(1, vocab, length).tolist())
    writer.write(example.SerializeToString())
writer.close()
