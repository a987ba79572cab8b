"""What one notebook needs beyond the floors below: its conclusions, explorers and figures, one module (or a
small subpackage) per notebook. Imports every floor below it; no floor below imports a lesson.
"""
