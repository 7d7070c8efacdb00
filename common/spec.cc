#include "common/spec.h"
