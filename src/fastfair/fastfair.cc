// fastfair.cc: compiles the FAST & FAIR tree (fastfair_tree.h) into the library.
#include "fastfair/fastfair_tree.h"
