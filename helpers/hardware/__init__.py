"""The machine and the GPUs: the CPU probe (instruction sets, cores, memory), the dated GPU table with its
sources, and running vLLM as another CPU kind would. Imports ``helpers.core`` only.
"""
