from .trainable_constructor import TrainableParamsOptimWrapperConstructor

__all__ = ['TrainableParamsOptimWrapperConstructor']
