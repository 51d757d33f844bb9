// <ldns/ldns.h> for C++. Debian's ldns was built without stdbool.h in its configuration,
// so its common.h defines `bool`, `true` and `false` as macros unless
// __bool_true_false_are_defined: in C++, every line after the include then reads `true`
// as the int 1 (a JSON value set to `true` became the number 1 in a test compiled in
// one unity file after a DNS test). Include this header, never ldns's directly.
#pragma once

#include <ldns/ldns.h>

#undef bool
#undef true
#undef false
