"""The machine and the GPUs: the CPU probe (instruction sets, cores, memory), the dated GPU table with its
sources, the MIG profiles of the 80 GB A100 and H100, and running vLLM as another CPU kind would. Imports
``helpers.core`` only.
"""
