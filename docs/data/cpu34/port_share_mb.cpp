#include <immintrin.h>
#include <cstdio>
#include <cstdint>
static inline uint64_t rd(){ unsigned a,d; __asm__ volatile("rdtsc":"=a"(a),"=d"(d)); return ((uint64_t)d<<32)|a;}
#define N 100000000LL
int main(){ __m256i w=_mm256_set1_epi8(1); __m256 fw=_mm256_set1_ps(1.0001f);
 __m256i a0=_mm256_set1_epi8(3),a1=_mm256_set1_epi8(5),a2=_mm256_set1_epi8(7),a3=_mm256_set1_epi8(9),a4=_mm256_set1_epi8(11),a5=_mm256_set1_epi8(13);
 __m256 f0=_mm256_set1_ps(1),f1=_mm256_set1_ps(2),f2=_mm256_set1_ps(3),f3=_mm256_set1_ps(4),f4=_mm256_set1_ps(5),f5=_mm256_set1_ps(6),f6=_mm256_set1_ps(7),f7=_mm256_set1_ps(8);
 __asm__ volatile("":"+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(w));
 for (int mode=0; mode<4; ++mode){
 uint64_t t=rd();
 for(long i=0;i<N;i++){
   if (mode&1){ a0=_mm256_maddubs_epi16(w,a0);a1=_mm256_maddubs_epi16(w,a1);a2=_mm256_maddubs_epi16(w,a2);a3=_mm256_maddubs_epi16(w,a3);a4=_mm256_maddubs_epi16(w,a4);a5=_mm256_maddubs_epi16(w,a5);}
   if (mode&2){ f0=_mm256_fmadd_ps(fw,f0,fw);f1=_mm256_fmadd_ps(fw,f1,fw);f2=_mm256_fmadd_ps(fw,f2,fw);f3=_mm256_fmadd_ps(fw,f3,fw);f4=_mm256_fmadd_ps(fw,f4,fw);f5=_mm256_fmadd_ps(fw,f5,fw);f6=_mm256_fmadd_ps(fw,f6,fw);f7=_mm256_fmadd_ps(fw,f7,fw);}
   __asm__ volatile("":"+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(f0),"+x"(f1),"+x"(f2),"+x"(f3),"+x"(f4),"+x"(f5),"+x"(f6),"+x"(f7));
 }
 t=rd()-t; printf("mode %d (1=6 mub, 2=8 fma, 3=both): %.3f tsc/iter\n", mode, (double)t/N);
 }
 printf("%d %f\n", _mm256_extract_epi32(_mm256_add_epi32(a0,_mm256_add_epi32(a1,a2)),0), _mm256_cvtss_f32(_mm256_add_ps(f0,f7)));
}
