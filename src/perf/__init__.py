"""The performance lab: what a training step costs, measured without running one on a GPU.

- `step_trace.py`: one training step run on FakeTensors (or small real ones), its live and saved
  bytes and FLOPs by tower and block.
- `cost_model.py`: FLOPs and memory per sample from those runs, a step's peak memory for a
  micro-batch (`CostModel.step_bytes`), the loss's share, and run time at an MFU.
- `planner.py`: the micro-batch, accumulation and checkpointing that fit a device (what
  `train.py --batch-size auto` runs, through src/training/batching.py).
- `traffic.py`: the memory traffic of one eager step by op class and source line.

src/training imports the planner (and the model's WKV shapes, for its warm-up);
benchmarks/training_cost.py and benchmarks/step_traffic.py are the command lines.
"""
