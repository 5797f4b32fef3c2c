"""Auto-tune's sample (``shardline.worker.tools.tune_sample``): the first input files up to the rows asked, copied
once, and laid out again when the widest split needs more files."""

from __future__ import annotations

import pyarrow.parquet as pq

from examples import synthetic
from shardline.worker.io.work_units import discover_inputs
from shardline.worker.tools.tune_sample import take_sample


def test_the_sample_takes_the_first_files_up_to_the_rows_and_cuts_the_last(tmp_path):
    data = tmp_path / "data"
    synthetic.make_dataset(data, files=3, rows=30_000, row_group_rows=4000)
    synthetic.write_table(synthetic.make_table(500, seed=9), data / "z.csv.gz", "csv")
    files, _ = discover_inputs(data)
    sample = take_sample(files, 15_000, tmp_path / "sample", min_files=2)
    assert sample.source_files == [("part-00000.parquet", 10_000), ("part-00001.parquet", 5_000)]
    assert sample.rows == 15_000 and sample.copies == 1
    cut = pq.ParquetFile(tmp_path / "sample" / "part-00001.parquet")
    assert cut.metadata.num_rows == 5_000 and cut.metadata.row_group(0).num_rows == 4000  # row groups kept
    whole = pq.read_table(tmp_path / "sample" / "part-00000.parquet")
    assert whole.equals(pq.read_table(data / "part-00000.parquet"))

    # Fewer files than the widest split's workers need: the sample is laid out again, the same bytes.
    more = take_sample(files, 15_000, tmp_path / "sample4", min_files=4)
    assert more.copies == 2 and more.rows_per_run == 30_000
    assert sorted(
        p.relative_to(tmp_path / "sample4").as_posix() for p in (tmp_path / "sample4").rglob("*.parquet")
    ) == [
        "copy-0/part-00000.parquet",
        "copy-0/part-00001.parquet",
        "copy-1/part-00000.parquet",
        "copy-1/part-00001.parquet",
    ]


def test_a_text_sample_keeps_its_format_and_cuts_by_lines(tmp_path):
    data = tmp_path / "data"
    synthetic.write_table(synthetic.make_table(900, seed=2), data / "a.csv.gz", "csv")
    files, _ = discover_inputs(data)
    sample = take_sample(files, 300, tmp_path / "sample", min_files=1)
    assert sample.source_files == [("a.csv.gz", 300)]
    import pyarrow.csv as pacsv

    assert pacsv.read_csv(tmp_path / "sample" / "a.csv.gz").num_rows == 300
